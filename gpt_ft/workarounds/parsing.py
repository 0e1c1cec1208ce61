"""jsonargparse's parse, faster: the action of a key found by index, a class value's parse remembered.

A `gpt-ft` command's parse is mostly jsonargparse walking the same parsers and adapting the same
values again; each function here removes one such repetition, and tests/test_workarounds.py
compares it with jsonargparse's own way on the fit parser."""

from __future__ import annotations


def index_action_lookups() -> None:
    """jsonargparse finds the action of a configuration key by walking every action of its parser
    (`find_action_and_subcommand`, jsonargparse/_subcommands.py), once for each key of each value it
    checks, completes with defaults, validates and instantiates: some 2,000 walks of about 100
    actions, a fifth of a `gpt-ft fit` parse. Here a parser without subcommands answers from an
    index of its actions by key, built again whenever its list of actions changes; a parser with
    subcommands is walked as before. No upstream issue; jsonargparse imports the function by name
    into `_core`, where it is replaced too. If either module stops holding it, or its rule changes
    (a key's action: the first action whose dest is the key or whose options include `--KEY`,
    skipping `exclude`'s types, config-loading ones only where no other matches), drop this
    (tests/test_workarounds.py compares both on the fit parser's every key)."""
    from jsonargparse import _core, _subcommands
    from jsonargparse._actions import ActionFail, _ActionConfigLoad, filter_non_parsing_actions

    walk = _subcommands.find_action_and_subcommand
    if getattr(walk, "indexed", False):
        return

    def find_action_and_subcommand(parser, dest, exclude=None):
        actions = parser._actions  # appended to (add_argument), taken from (removals), never reordered
        stamp = (id(actions), len(actions), id(actions[-1]) if actions else None)
        # (its actions' stamp, key -> actions, or None), kept on the parser: held anywhere else, the
        # actions (which hold their parser) would keep it, and all a run's CLI reaches, alive
        known = getattr(parser, "_gpt_ft_action_index", None)
        if known is None or known[0] != stamp:
            kept = filter_non_parsing_actions(actions)
            index = None if any(isinstance(a, _subcommands.ActionSubCommands) for a in kept) else {}
            for action in kept if index is not None else ():
                for key in {action.dest, *(o[2:] for o in action.option_strings if o.startswith("--"))}:
                    index.setdefault(key, []).append(action)
            known = parser._gpt_ft_action_index = (stamp, index)
        if known[1] is None:
            return walk(parser, dest, exclude=exclude)
        config_load = None
        for action in known[1].get(dest, ()):
            if exclude is not None and isinstance(action, exclude):
                continue
            if not isinstance(action, (_ActionConfigLoad, ActionFail)):
                return action, None
            config_load = action
        return config_load, None

    find_action_and_subcommand.indexed = True
    find_action_and_subcommand.walk = walk
    _subcommands.find_action_and_subcommand = _core.find_action_and_subcommand = find_action_and_subcommand


def remember_class_parses(*bases: type, size: int = 256) -> None:
    """jsonargparse adapts a class value afresh each time it meets one (`adapt_class_type`,
    jsonargparse/_typehints.py): the data module and its task card four times a `gpt-ft fit` parse
    (the defaults, the argument, the sub-defaults, validation), and again at every command and every
    run of `gpt-ft suite`. Here a parse (not a dump, not an instantiation) of a value of a subclass
    of `bases`, made of plain data (`plain`) with no text that might name a file for jsonargparse to
    read (`readable`: a card given by its path, or a file named inside it, is read afresh every
    time), is answered from the first parse of the same value over the same earlier value, by the
    same class parser (jsonargparse caches those by class and settings; none that reads the
    environment), in the same parse settings and working folder: a copy of its result, and the
    earlier value's fields taken out again where it was of another class. Errors are not remembered.
    A process that parses again (`gpt-ft suite`, Python callers) parses a `gpt-ft fit` command in 33
    ms instead of 80 (its first parse, 0.2 s, as before). The classes must depend on nothing else
    while parsed (no environment of their own, no parse-time links into them). No upstream issue;
    the function, its context variables and its callers (which take the value it returns) are
    private: if any of them changes, drop this (tests/test_workarounds.py compares both ways)."""
    import os
    from collections import OrderedDict

    from jsonargparse import Namespace, _common, _paths, _typehints

    adapt = _typehints.adapt_class_type
    if getattr(adapt, "bases", None) is not None:
        adapt.bases.update(bases)
        return
    bases = set(bases)
    remembered: OrderedDict = OrderedDict()  # key -> a copy of the parse's result, newest last
    settings = (
        _typehints.sub_defaults,
        _common.lenient_check,
        _common.load_value_mode,
        _common.parsing_defaults,
        _common.validating_defaults,
        _paths._current_path_dir,
    )

    def key_of(value, sub_add_kwargs, prev_val, partial_skip_args, typehint):
        """What the parse of `value` depends on, or None where it is not remembered."""
        spec = _typehints.subclass_spec_as_namespace(value)
        try:
            cls = _typehints.import_object(spec.class_path)
        except Exception:  # not a class value: jsonargparse's own parse
            return None
        if not (isinstance(cls, type) and issubclass(cls, tuple(bases))):
            return None
        now = [v.get() for v in settings]
        folders = (os.getcwd(), *([now[-1]] if now[-1] else []))  # (where a relative path is read)
        try:
            data = plain((value, prev_val, partial_skip_args, now, folders), lambda t: readable(t, folders))
        except (TypeError, ValueError):  # not plain data, or a file's name
            return None
        parser = _typehints.ActionTypeHint.get_class_parser(cls, sub_add_kwargs, skip_args=partial_skip_args)
        if parser.default_env:  # its defaults read from the environment
            return None
        return id(parser), repr(typehint), data

    def earlier_fields(prev_val) -> set[str]:
        """The fields of the earlier value that a parse of another class may take out of it."""
        init_args = prev_val.get("init_args") if isinstance(prev_val, Namespace) else None
        return set(vars(init_args)) if isinstance(init_args, Namespace) else set()

    def adapt_class_type(  # jsonargparse's signature; its callers give the last three by name
        value,
        serialize,
        instantiate_classes,
        sub_add_kwargs,
        prev_val=None,
        partial_skip_args=None,
        typehint=None,
    ):
        given = (value, serialize, instantiate_classes, sub_add_kwargs, prev_val, partial_skip_args, typehint)
        if serialize or instantiate_classes:
            return adapt_class_type.original(*given)
        key = key_of(value, sub_add_kwargs, prev_val, partial_skip_args, typehint)
        if key is not None and key in remembered:
            remembered.move_to_end(key)
            result, taken = remembered[key]
            for field in taken:  # as the parse did, where the earlier value was of another class
                prev_val.init_args.pop(field, None)
            return result.clone()
        fields = earlier_fields(prev_val)
        result = adapt_class_type.original(*given)
        if key is not None and isinstance(result, Namespace):
            remembered[key] = result.clone(), tuple(sorted(fields - earlier_fields(prev_val)))
            if len(remembered) > size:
                remembered.popitem(last=False)
        return result

    adapt_class_type.bases = bases
    adapt_class_type.original = adapt
    _typehints.adapt_class_type = adapt_class_type


def plain(value, refuse=lambda text: False):
    """`value` (Namespaces, mappings, lists and tuples of text, numbers, booleans, None and paths) as
    a hashable key that tells every value and type apart (1, 1.0 and True, -0.0 and 0.0, a Namespace
    and a mapping; a jsonargparse path by its mode, text and working folder); TypeError for anything
    else, and for a text that `refuse`s."""
    from os import PathLike

    from jsonargparse import Namespace

    if type(value) is str:
        if refuse(value):
            raise TypeError(f"a text refused: {value!r}")
        return "str", value
    if value is None or type(value) in (int, bool):
        return type(value).__name__, value
    if type(value) is float:
        return "float", repr(value)
    if isinstance(value, PathLike):  # (a file a value was read from: `__path__`)
        return type(value).__name__, repr(value)
    if isinstance(value, Namespace) or type(value) is dict:
        items = vars(value).items() if isinstance(value, Namespace) else value.items()
        return type(value).__name__, tuple((plain(k), plain(v, refuse)) for k, v in items)
    if type(value) in (list, tuple):
        return type(value).__name__, tuple(plain(v, refuse) for v in value)
    raise TypeError(f"not plain data: {type(value).__name__}")


def readable(text: str, folders: tuple[str, ...]) -> bool:
    """Whether jsonargparse might read `text` as the content of a file: standard input ('-'), a URL
    (`file://` too), or anything but a folder that the path names (`~` expanded), as it stands or in
    one of `folders`."""
    import os

    if text == "-" or "://" in text:
        return True
    if not text or "\n" in text or len(text) > 4096:
        return False
    path = os.path.expanduser(text)
    return any(
        os.path.lexists(p) and not os.path.isdir(p) for p in (path, *(os.path.join(f, path) for f in folders))
    )


def remember_key_splits(size: int = 4096) -> None:
    """jsonargparse's Namespace parses a dotted key ("data.init_args.task") afresh at every get, set
    and `in` (`Namespace._parse_key`, jsonargparse/_namespace.py): checks it, splits it and marks each
    part that clashes with a Namespace attribute, some 13,000 times a `gpt-ft fit` (5-8% of a small
    run). Here each key's parts are remembered (they depend on the key alone: the clashing names are
    fixed at import) and only the walk down the namespace is done again; errors are not remembered.
    No upstream issue; if the method is renamed or its rule changes (an error for a key that is no
    text, holds a space or an empty part; the leaf, the parent namespace or None where a part is
    missing or no namespace, the parent's key), drop this (tests/test_workarounds.py compares both
    ways on every key a `gpt-ft fit` parse asks, and on bad keys)."""
    from jsonargparse import _namespace

    namespace = _namespace.Namespace
    parse_key = namespace._parse_key
    if getattr(parse_key, "original", None) is not None:
        return
    parts: dict[str, tuple[str, tuple[str, ...], str]] = {}

    def _parse_key(self, key):
        known = parts.get(key) if type(key) is str else None
        if known is None:
            leaf, _, parent_key = parse_key(namespace(), key)  # (its errors, for a bad key)
            path = tuple(parent_key.split(".")) if parent_key else ()
            known = leaf, path, parent_key
            if len(parts) >= size:
                parts.clear()
            if type(key) is str:
                parts[key] = known
        leaf, path, parent_key = known
        parent = self
        for part in path:
            if hasattr(parent, part) or (isinstance(parent, dict) and part in parent):
                parent = parent[part]
                if parent is not None and not isinstance(parent, (namespace, dict)):
                    return leaf, None, parent_key
            else:
                return leaf, None, parent_key
        return leaf, parent, parent_key

    _parse_key.original = parse_key
    namespace._parse_key = _parse_key
