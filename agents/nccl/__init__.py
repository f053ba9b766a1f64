"""The NCCL profiler plugin (C, ``plugin.c``, built by ``make nccl-plugin``), its frame codec
(``wire``) and the framework side's registration of communicators (``registration``)."""
