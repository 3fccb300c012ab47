"""What the user typed or named, read safely (layer 0, no heavy imports): `digits` (text that
`int()` may read) and `files` (a file a flag names, bounded in size and in the wait)."""
