"""One module per resource of the HTTP API (DESIGN.md section 6)."""
