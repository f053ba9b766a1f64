"""The per-host agent daemon: phase stream, local endpoint, GPU health sources and reporter."""
