"""Worker processes: the zygote and its rehearsal, the pool's manager, pipe reads, forged messages, a worker's exit."""
