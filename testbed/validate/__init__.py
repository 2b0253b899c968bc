"""Published results reproduced on the testbed: the cases (what each predicts and how it is
judged) and the suite that runs them (``python -m testbed validate``)."""
