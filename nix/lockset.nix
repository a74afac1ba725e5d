# The lockset of docs/interface.md §5, with Nix builtins only (no nixpkgs), so the
# flake can label an image with the same digest `cibox image lockset` computes.
#
#   import ./lockset.nix { root = ./.; locks = [ "flake.lock" "images/demo/*" ]; }
#   => { files = [ { path; sha256; } ... ]; text = "<sha256>  <path>\n..."; digest = "sha256:..."; }
#
# Patterns are relative to `root`: `*` and `?` stay within a folder, `**` crosses
# folders (`a/**/b` also matches `a/b`); a pattern without them names one file. A pattern
# matching no regular file, and an empty list, are errors, as in cibox.
{
  root,
  locks,
}: let
  inherit
    (builtins)
    attrNames
    concatLists
    concatStringsSep
    filter
    foldl'
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
    throw
    ;

  isGlob = p: match ".*[][*?].*" p != null;

  # Is `p` a directory (following symlinks)? `p/.` exists only for directories; as a
  # string, because a path value drops the `/.`.
  isDir = p: pathExists "${toString p}/.";
  isFile = p: pathExists p && !(isDir p);

  # The regular files (or symlinks to one) under root/rel, as relative paths, at most
  # `depth` folders down (-1: no limit).
  walk = rel: depth: let
    dir =
      if rel == ""
      then root
      else root + "/${rel}";
    entries = readDir dir;
    child = name:
      if rel == ""
      then name
      else "${rel}/${name}";
    deeper = p:
      if depth == 0
      then []
      else walk p (depth - 1);
    visit = name: let
      type = entries.${name};
      p = child name;
      full = root + "/${p}";
    in
      if type == "directory"
      then deeper p
      else if type == "regular"
      then [p]
      else if type == "symlink"
      then
        (
          if isDir full
          then deeper p
          else if isFile full
          then [p]
          else []
        )
      else [];
  in
    if isDir dir
    then concatLists (map visit (attrNames entries))
    else [];

  # Where a pattern's matches can be: below its literal leading folders, and no deeper
  # than its number of components unless it has `**`.
  candidates = pattern: let
    parts = filter builtins.isString (builtins.split "/" pattern);
    lead = takeWhile (c: !(isGlob c)) parts;
    base = concatStringsSep "/" lead;
    rest = length parts - length lead;
    depth =
      if match ".*[*][*].*" pattern != null
      then -1
      else rest - 1;
  in
    walk base depth;

  takeWhile = pred: list: let
    go = l:
      if l == [] || !(pred (head l))
      then []
      else [(head l)] ++ go (builtins.tail l);
  in
    go list;

  # Glob to POSIX ERE, one character at a time.
  chars = s: genList (i: substring i 1 s) (stringLength s);
  special = ["." "+" "(" ")" "{" "}" "|" "^" "$" "\\"];
  toRegex = glob: let
    step = acc: c:
      if acc.skip > 0
      then acc // {skip = acc.skip - 1;}
      else if acc.inClass
      then
        acc
        // {
          # `[!…]` negates in a glob, `[^…]` in a regex.
          out =
            acc.out
            + (
              if c == "!" && acc.classStart
              then "^"
              else c
            );
          inClass = c != "]" || acc.classStart;
          classStart = false;
        }
      else if c == "*" && acc.next2 glob acc.i == "**/"
      then
        acc
        // {
          out = acc.out + "(.*/)?";
          skip = 2;
        }
      else if c == "*" && acc.next2 glob acc.i == "**"
      then
        acc
        // {
          out = acc.out + ".*";
          skip = 1;
        }
      else if c == "*"
      then acc // {out = acc.out + "[^/]*";}
      else if c == "?"
      then acc // {out = acc.out + "[^/]";}
      else if c == "["
      then
        acc
        // {
          out = acc.out + "[";
          inClass = true;
          classStart = true;
        }
      else if builtins.elem c special
      then acc // {out = acc.out + "\\" + c;}
      else acc // {out = acc.out + c;};
    indexed =
      foldl'
      (acc: c: (step acc c) // {i = acc.i + 1;})
      {
        out = "";
        skip = 0;
        inClass = false;
        classStart = false;
        i = 0;
        next2 = g: i: substring i 3 g;
      }
      (chars glob);
  in
    indexed.out;

  expand = pattern: let
    found =
      if isGlob pattern
      then filter (f: match (toRegex pattern) f != null) (candidates pattern)
      else if isFile (root + "/${pattern}")
      then [pattern]
      else [];
  in
    if found == []
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
      sha256 = hashFile "sha256" (root + "/${p}");
    })
    paths;

  # Exactly what GNU sha256sum prints: names with \, newline or CR are escaped and the
  # line starts with a backslash.
  needsEscape = p: match ".*[\\\n\r].*" p != null;
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
