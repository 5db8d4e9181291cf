"""One-off studies behind the research notes; no published table depends on them."""
