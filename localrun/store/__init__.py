"""Where models live and how they get there: MODEL → file (``resolve``: the models folder, the embedded
default model, other tools' folders, names and paths), `localrun pull` (``pull``) over resumable,
verified downloads (``download``), and what `show`/`fit`/`ps` report about a model (``info``)."""
