"""Pure discovery: records matched against class rules, rendered into devices, kept
as per-class inventories; sharing devices in slots; where a device sits on the PCI bus.
"""
