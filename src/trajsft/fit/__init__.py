"""Will the train step fit the slice, and what will the run cost? (``trajsft fit``)."""
