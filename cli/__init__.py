"""The ``quantscope`` command line (:func:`quantscope.cli.main.main`); one module per verb group."""
