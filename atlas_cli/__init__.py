"""The ``atlas`` command, thin: it imports each half only for its own subcommands (``atlas operator`` and
``atlas render`` need only ``atlas_operator`` and ``atlas_contract``; ``demo``, ``train`` and ``eval`` need
``atlas_core``), so the operator image ships no training library."""
