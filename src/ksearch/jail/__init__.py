"""The sandbox: the worker process as the judge sees it (`sandbox`), the jail it enters (`jail`, `jail_fs`: the
standard library only, entered before anything else loads) and the compile jail (`compile_jail`)."""
