"""L2L: layer-to-layer execution with a host param server, a two-slot device relay and cross mixed precision."""
