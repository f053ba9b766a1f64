"""Emulated devices served over real sockets: TL1, RESTCONF, MZI (Qontrol) and whole fabrics."""
