# The source mount must be read-only inside the container.
if touch /src/.cibox-write-probe 2>/dev/null; then rm -f /src/.cibox-write-probe; exit 1; fi
