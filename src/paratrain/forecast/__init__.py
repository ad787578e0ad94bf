"""`paratrain plan`: predicted step time, communication and memory per GPU at scales
not at hand. model.py: the formulas; calibrate.py: the measurements here (one device's step,
the link); predict.py: rows and advice; command.py: the command (calibrations, --measure,
forecast.json, the table)."""
