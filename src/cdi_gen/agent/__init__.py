"""The node agent (``cdi-gen run``): udev discovery in, CDI spec files out, and each class's
devices handed to the feature that serves them to the kubelet.

* :mod:`~cdi_gen.agent.agent`: the process: settings, the udev source, one class runner per
  class, the metrics server, start and exit;
* :mod:`~cdi_gen.agent.runner`: one class's loop: a device change becomes a spec write and a
  publish to the class's frontend;
* :mod:`~cdi_gen.agent.frontend`: what a runner publishes through, whichever feature
  (:mod:`cdi_gen.deviceplugin` or :mod:`cdi_gen.dra`) is behind it;
* :mod:`~cdi_gen.agent.comebacks`: which devices of a class came back with other numbers;
* :mod:`~cdi_gen.agent.whenback`: a class's ``whenBack`` (``restart``, ``follow``) applied to
  them after their spec is written, off the loop and bounded;
* :mod:`~cdi_gen.agent.holders`: the containers holding a device (kubelet and CRI);
* :mod:`~cdi_gen.agent.follow`: the ``follow`` step (its holders' cgroups and nodes);
* :mod:`~cdi_gen.agent.privileges`: what the agent may do to a running container, and so
  the ``whenBack`` each class runs with.
"""
