"""Models of time: topologies, the network simulator, closed-form costs, choosing ("auto") and
explaining a choice. Reads schedules; knows nothing of processes."""
