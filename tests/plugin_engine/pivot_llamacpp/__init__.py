"""llama.cpp's `llama-server` as a pivot engine: its flag catalog, its argument types, its model flag (`-m`)."""
