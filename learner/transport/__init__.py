"""Transport: the gRPC server and its security, the wire messages and their checks, the
connected actors, and the served run that the server's handlers share."""
