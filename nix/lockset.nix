# The lockset of docs/interface.md §5, with Nix builtins only (no nixpkgs), so the
# flake can label an image with the same digest `cibox image lockset` computes.
#
#   import ./lockset.nix { root = ./.; locks = [ "flake.lock" "images/demo/*" ]; }
#   => { files = [ { path; sha256; } ... ]; text = "<sha256>  <path>\n..."; digest = "sha256:..."; }
#
# `root` is a path value (in a flake: `./.`, the flake's copy in the store). Patterns are
# relative to it: `*`, `?` and `[…]` stay within a folder, `**` (a whole component)
# crosses folders (`a/**/b` also matches `a/b`; a trailing `a/**` is every file below
# `a`, at any depth); a pattern without them names one file.
# Only regular files count, a symlink as what it points to. Refused as by cibox, with
# its messages: an empty list; a pattern that is empty, absolute or has `..`; a pattern
# matching no regular file; a pattern without glob characters that names a folder (or
# anything else that is not a regular file); a bad glob (`***`, `**` inside a component,
# an unclosed `[`).
#
# Works on every Nix from 2.8 on, in pure evaluation (flakes) and impure. Entry types
# come from `readDir` of their folder. A symlink is followed: `pathExists` says whether
# its target exists, and whether that target is a folder is asked in one of two ways,
# chosen by trying this very file (a regular file): where `pathExists "<file>/."` is
# false, this Nix reads a trailing `/.` as "is a folder" (Nix 2.19 on, and impure
# evaluation before 2.19), and `pathExists "<link>/."` answers; elsewhere (pure
# evaluation before 2.19 normalises the `/.` away) the link's target is added to the
# store with a filter that drops every entry, which yields the store path of an empty
# folder exactly when the target is a folder. Known limits: a symlink leaving the flake
# cannot be followed in pure evaluation and counts as missing; in impure evaluation
# before Nix 2.19 a dangling symlink that a pattern matches counts as a file and fails
# when hashed (cibox skips it, or says the pattern matches no file).
{
  root,
  locks,
}: let
  inherit
    (builtins)
    attrNames
    concatLists
    concatStringsSep
    elemAt
    filter
    genList
    hashFile
    hashString
    head
    length
    listToAttrs
    map
    match
    pathExists
    readDir
    replaceStrings
    stringLength
    substring
    tail
    throw
    ;

  # --- What a path is, symlinks followed -------------------------------------------

  # Does this Nix read a trailing `/.` as "is a folder"? This file is a regular file.
  dotMeansDir = !(pathExists "${toString ./lockset.nix}/.");

  # The target copied with every entry filtered out: an empty folder's store path when
  # it is a folder (pure evaluation before Nix 2.19 resolves the link when copying).
  probe = p:
    builtins.path {
      name = "cibox-lockset-probe";
      path = p;
      filter = _: _: false;
    };
  isDirLink = p:
    if dotMeansDir
    then pathExists "${toString p}/."
    else probe p == probe root;

  at = rel:
    if rel == ""
    then root
    else root + "/${rel}";

  # What `rel`, an entry of type `type` in its folder's `readDir`, is with links
  # followed: "regular", "directory", "missing" or "other".
  follow = rel: type:
    if type == "regular" || type == "directory"
    then type
    else if type != "symlink"
    then "other"
    else if !(pathExists (at rel))
    then "missing"
    else if isDirLink (at rel)
    then "directory"
    else "regular";

  # What the path of components `parts` is, links followed; "notdir" when a folder on
  # the way is not one. A `.` component is its folder.
  lookup = parts:
    if parts == []
    then "directory"
    else let
      n = length parts;
      parent = genList (elemAt parts) (n - 1);
      name = elemAt parts (n - 1);
      above = lookup parent;
      entries = readDir (at (concatStringsSep "/" parent));
    in
      if above == "missing"
      then "missing"
      else if above != "directory"
      then "notdir"
      else if name == "."
      then "directory"
      else if !(entries ? ${name})
      then "missing"
      else follow (concatStringsSep "/" parts) entries.${name};

  # The regular files (links followed) under root/rel, as relative paths, at most
  # `depth` folders down (-1: no limit).
  walk = rel: depth: let
    entries = readDir (at rel);
    child = name:
      if rel == ""
      then name
      else "${rel}/${name}";
    visit = name: let
      p = child name;
      kind = follow p entries.${name};
    in
      if kind == "directory"
      then
        (
          if depth == 0
          then []
          else walk p (depth - 1)
        )
      else if kind == "regular"
      then [p]
      else [];
  in
    concatLists (map visit (attrNames entries));

  # --- Patterns ------------------------------------------------------------------------

  # A pattern's components as cibox reads them: empty ones dropped (`a//b*` is `a/b*`),
  # and leading `.` ones (`./a` is `a`); other `.` ones stay, in the paths too.
  components = pattern: let
    dropDots = l:
      if l != [] && head l == "."
      then dropDots (tail l)
      else l;
  in
    dropDots (filter (c: c != "") (filter builtins.isString (builtins.split "/" pattern)));

  # A literal pattern's path as cibox records it: the text, less leading `./` (and the
  # slashes after one).
  literalPath = s:
    if substring 0 2 s == "./"
    then literalPath (substring 2 (stringLength s) s)
    else if substring 0 1 s == "/" && s != "/"
    then literalPath (substring 1 (stringLength s) s)
    else s;

  # Whether `s` holds a match of `re` anywhere (`.*` would stop at a newline).
  contains = re: s: length (builtins.split re s) > 1;

  isGlob = contains "[[*?]";

  badPattern = pattern: reason: throw "lock pattern `${pattern}` is not a valid glob: ${reason}";

  chars = s: genList (i: substring i 1 s) (stringLength s);

  # One component of a glob as a POSIX ERE (the one `builtins.match` takes) that never
  # crosses a `/`. Classes follow the glob crate: the first character after `[` or `[!`
  # belongs to the class, so `[]a]` holds `]` and `a`.
  componentRegex = pattern: c: let
    go = s:
      if s == ""
      then ""
      else let
        ch = substring 0 1 s;
        rest = substring 1 (stringLength s) s;
      in
        if ch == "*"
        then "[^/]*" + go rest
        else if ch == "?"
        then "[^/]" + go rest
        else if ch == "["
        then let
          negated = substring 0 1 rest == "!";
          m =
            if negated
            then match "!(.[^]]*)[]](.*)" rest
            else match "(.[^]]*)[]](.*)" rest;
        in
          if m == null
          then badPattern pattern "invalid range pattern"
          else bracket negated (head m) + go (elemAt m 1)
        else if ch == "\\"
        then "\\\\" + go rest
        else if ch == "^"
        then "\\^" + go rest
        else if builtins.elem ch ["." "+" "(" ")" "{" "}" "|" "$"]
        then "[${ch}]" + go rest
        else ch + go rest;
    bracket = negated: body: let
      b = replaceStrings ["\\"] ["\\\\"] body;
      len = stringLength b;
      trailingDash = len > 1 && substring (len - 1) 1 b == "-";
      core =
        if trailingDash
        then substring 0 (len - 1) b
        else b;
    in
      if negated
      then
        "[^${core}/"
        + (
          if trailingDash
          then "-"
          else ""
        )
        + "]"
      else if b == "^"
      then "\\^"
      else if substring 0 1 b == "^"
      then "[${substring 1 len b}^]"
      else "[${b}]";
  in
    if contains "[*][*][*]" c
    then badPattern pattern "wildcards are either regular `*` or recursive `**`"
    else if c != "**" && contains "[*][*]" c
    then badPattern pattern "recursive wildcards must form a single path component"
    else go c;

  # The whole pattern as a regex over relative paths; `**` is any number of folders.
  toRegex = pattern: parts: let
    n = length parts;
    piece = i: let
      c = elemAt parts i;
      last = i == n - 1;
    in
      if c == "**"
      then "([^/]*/)*"
      else
        componentRegex pattern c
        + (
          if last
          then ""
          else "/"
        );
  in
    concatStringsSep "" (genList piece n);

  takeWhile = pred: list:
    if list == [] || !(pred (head list))
    then []
    else [(head list)] ++ takeWhile pred (tail list);

  # Regular files a glob matches: below its literal leading folders, and no deeper than
  # its number of components unless it has `**`. A trailing `**` is `**/*`: every file
  # below (as cibox reads it).
  globFiles = pattern: given: let
    parts =
      if elemAt given (length given - 1) == "**"
      then given ++ ["*"]
      else given;
    lead = takeWhile (c: !(isGlob c)) parts;
    rest = length parts - length lead;
    depth =
      if builtins.elem "**" parts
      then -1
      else rest - 1;
    regex = toRegex pattern parts;
    candidates =
      if lookup lead == "directory"
      then walk (concatStringsSep "/" lead) depth
      else [];
  in
    builtins.seq regex (filter (f: match regex f != null) candidates);

  # A pattern without glob characters names one regular file; a trailing `/` (or `/.`)
  # asks for a folder, as the file system does.
  literalFile = pattern: parts: let
    kind = lookup parts;
    len = stringLength pattern;
    folderWanted = substring (len - 1) 1 pattern == "/" || substring (len - 2) 2 pattern == "/.";
    unreadable = reason: throw "lock file `${pattern}` cannot be read: ${reason}";
  in
    if kind == "missing"
    then []
    else if kind == "notdir" || (kind == "regular" && folderWanted)
    then unreadable "Not a directory (os error 20)"
    else if kind == "regular"
    then [(literalPath pattern)]
    else unreadable "is not a regular file";

  expand = pattern: let
    parts = components pattern;
    found =
      if isGlob pattern
      then globFiles pattern parts
      else literalFile pattern parts;
  in
    if pattern == "" || substring 0 1 pattern == "/" || builtins.elem ".." parts
    then throw "lock pattern `${pattern}` must be a relative path inside the manifest's folder"
    else if found == []
    then throw "lock pattern `${pattern}` matches no file under ${toString root}"
    else found;

  paths =
    if locks == []
    then throw "image.locks is empty: list the files that define the image (lock files, its recipe)"
    else
      attrNames (listToAttrs (map (p: {
        name = p;
        value = null;
      }) (concatLists (map expand locks))));

  files =
    map (p: {
      path = p;
      sha256 = hashFile "sha256" (at p);
    })
    paths;

  # Exactly what GNU sha256sum prints: names with \, newline or CR are escaped and the
  # line starts with a backslash.
  needsEscape = contains "[\\\\\n\r]";
  escape = replaceStrings ["\\" "\n" "\r"] ["\\\\" "\\n" "\\r"];
  line = f:
    if needsEscape f.path
    then "\\${f.sha256}  ${escape f.path}\n"
    else "${f.sha256}  ${f.path}\n";

  text = concatStringsSep "" (map line files);
in {
  inherit files text;
  digest = "sha256:" + hashString "sha256" text;
}
