"""Authentication: internal JWTs (RS256) and the DRF authentication classes."""
