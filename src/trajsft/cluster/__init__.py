"""Training on a Ray TPU cluster: the driver's slice loop (``slices``), what runs on every host of
the slice (``host``), and the Levanter patch every worker of the job loads (``hooks``)."""
