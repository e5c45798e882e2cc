"""What a plugin author writes: node kinds (Node), their config attributes
(Field) and their ports (Port)."""

import json


class Field:
    """A config attribute: type is string, number, int, bool, list(string)
    or list(number)."""

    def __init__(self, name, type, default=None, required=False, doc="", path=""):
        # path: "read" or "write" when the attribute names files the node
        # reads or writes (a dflow worker checks them against its roots)
        self.name, self.type, self.default = name, type, default
        self.required, self.doc, self.path = required, doc, path


class Port:
    """A port: an input unless output; same_as makes an output's type the
    type of the named input's edge."""

    def __init__(self, name, type="", output=False, same_as="", doc=""):
        self.name, self.type, self.output = name, type, output
        self.same_as, self.doc = same_as, doc


class Node:
    """A node kind. Subclasses set name, doc and config, and define ports
    (for a config) and run (one replica); check may return errors as
    (field, message) pairs. group = True makes it a group kind (protocol
    version 2): its replicas step together, each a process of its own
    started with the environment torchrun gives a rank (RANK, WORLD_SIZE,
    MASTER_ADDR, ...), with the group's collectives on the replica
    (barrier, all_reduce, steps, finish, saves, saved). restores = True
    (a group kind) says its group saves its state and restores a save:
    on a cluster, a member lost with its worker restarts the group whole,
    as, in one process, a member whose process dies does where its stage
    allows restarts; every member is told the save to restore
    (Replica.restore_step)."""

    name = ""
    doc = ""
    config = []
    group = False
    restores = False

    def ports(self, config):
        raise NotImplementedError

    def check(self, config):
        return []

    def run(self, replica):
        raise NotImplementedError


def _config(kind, config_json):
    """The config values, defaults filled in, and the field errors."""
    try:
        given = json.loads(config_json or "{}")
    except ValueError as e:
        return None, [("", "config is not JSON: %s" % e)]
    fields = {f.name: f for f in kind.config}
    errors = [(k, "unknown attribute") for k in given if k not in fields]
    config = {}
    for f in kind.config:
        if f.name in given:
            config[f.name] = given[f.name]
        elif f.required:
            errors.append((f.name, "required"))
        else:
            config[f.name] = f.default
    return config, errors
