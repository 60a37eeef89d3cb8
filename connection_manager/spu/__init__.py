"""The SPU simulator: an SPU's SC session and replica offsets without payloads (tests, benchmarks, the demo)."""
