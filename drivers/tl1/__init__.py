"""TL1 optical circuit switch driver (Polatis/Calient dialects) and its wire format."""
