"""Serving a class as a kubelet device plugin (``deviceplugin/v1beta1``), one plugin per class.

* :mod:`~cdi_gen.deviceplugin.server`: the gRPC service (ListAndWatch, Allocate, options) and
  its registration with the kubelet;
* :mod:`~cdi_gen.deviceplugin.allocation`: the rules Allocate's answers follow (pure);
* :mod:`~cdi_gen.deviceplugin.board`: the device list the server advertises;
* :mod:`~cdi_gen.deviceplugin.frontend`: the class runner's side of it.

Independent of :mod:`cdi_gen.dra` (``.importlinter``).
"""
