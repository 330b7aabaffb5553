"""How a step runs over processes: who this process is under torchrun and the data-parallel
hooks (`distributed`)."""
