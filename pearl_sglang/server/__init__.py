"""PEARL's server: the composition root that joins the data path and the control plane.

``router`` (the data path) and ``control`` (the control plane) do not import each other.
Here both are built over one state store and wired through their ports: the control plane
reaches the router through ``control.data_plane.DataPlane`` (implemented by
``router.data_plane.RouterDataPlane``), the router reads the control plane through
``router.state.ControlView``. The HTTP routes that drive the control plane (admin API,
worker API, SGLang's engine-control calls) live here too, and so does the CLI.
"""
