"""The pure core: phase coordination, planning, decisions, cost model, spares. No I/O, no
asyncio."""
