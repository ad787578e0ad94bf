"""`paratrain plan` (issue 18): predicted step time, communication and memory per GPU at scales
not at hand. model.py holds the formulas; the calibration and the command come next."""
