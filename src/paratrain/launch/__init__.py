"""Starting a run and seeing it end: torchrun's elastic agent (torchrun.py), the fork server's
guarded imports (preload.py), the launch's processes as a whole (job.py: signals forwarded, how
each ended, said once; procs.py: /proc's view of them) and the run folder that holds it all
(runfolder/: its ledger of the run's own files and --overwrite's setting aside)."""
