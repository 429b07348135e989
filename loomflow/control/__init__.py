"""What an operator does with a store, shared by the command line and the web console.

``source`` is the one factory of a store's runtime, log reader, audit trail and analytics
tables from a command's arguments (``--db``, or the ``LOOMFLOW_*`` settings); ``verbs``
the lifecycle verbs over an open runtime (fork, signal, cancel, erase, resume, retry);
``agents`` loads ``module:factory`` as ``loomflow worker`` does; ``status`` the status a
person reads; ``refused`` the error a request is turned down with; ``when`` the moments
an operator writes. Nothing here prints to stdout: the caller shows the answer.
"""
