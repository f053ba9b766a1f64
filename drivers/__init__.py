"""Switch drivers behind one ``drivers.base.Driver`` protocol, chosen by config ``model:``."""
