"""Silicon-photonic MZI mesh driver: Benes routing, calibration, Qontrol-style wire protocol."""
