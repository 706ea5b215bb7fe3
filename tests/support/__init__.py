"""Test support: emulators and fixtures shared by several test modules and benchmarks."""
