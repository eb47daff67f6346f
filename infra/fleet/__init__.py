"""Fleet config, scaling policy, controller, actuators, reaper, the local fleet."""
