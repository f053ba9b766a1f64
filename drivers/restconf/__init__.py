"""RESTCONF driver for the Polatis optical-switch YANG model and its wire format."""
