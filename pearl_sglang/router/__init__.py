"""The router: HTTP shell over a transport-free routing core (``selection``, ``stitch``)."""
