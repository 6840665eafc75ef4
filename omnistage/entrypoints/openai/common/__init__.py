"""What every API shares: admission, auth, body and budget limits, errors, metrics, streaming, the served model."""
