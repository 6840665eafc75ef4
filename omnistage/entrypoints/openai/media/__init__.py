"""Media a request names (data:, file://, http(s)://): fetched under the server's policy, probed, decoded."""
