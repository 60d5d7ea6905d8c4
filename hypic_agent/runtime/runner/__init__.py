"""The model runner: a preallocated state pool and one layer loop that runs any forward plan."""
