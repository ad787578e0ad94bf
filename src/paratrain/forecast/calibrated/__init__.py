"""The calibrated forecast: one device's step measured (calibrate.py), its spread judged
(spread.py), and the step at N GPUs predicted per data-parallel strategy from that measurement
and a link's bandwidth (model.py's formulas, predict.py)."""
