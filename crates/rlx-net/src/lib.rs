//! TCP transport for RLX (`TcpTransport`): rendezvous, handshake, framing, progress, timeouts and failure detection will live here.
