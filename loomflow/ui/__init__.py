"""The web console, ``loomflow ui`` (the ``[ui]`` extra): the sessions of a store, their
transcripts, runs, checkpoints and fork trees, what is live, and the actions of the
command line, in a browser, served by this process only (``app.create_app``)."""
