"""Import-only stand-in (see ../../README.md)."""
