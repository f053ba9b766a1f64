"""Switch drivers behind one ``lightrail.drivers.base.Driver`` protocol, chosen by config
``model:``."""
