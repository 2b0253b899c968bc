"""What a user asks: scenarios (typed, validated, with defaults), the built-in ones, the key
reference generated from them, and the time scale a scenario runs at on this machine
(calibration, memory check)."""
