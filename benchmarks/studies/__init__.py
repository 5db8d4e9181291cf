"""One-off method studies: scripts behind research notes, on which no published table or suite stage depends."""
