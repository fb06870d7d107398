"""Tools built on the runtime and the models: the local launcher, emulated links, the
benchmark, calibration, fault injection, trace files, the flight doctor and plots."""
