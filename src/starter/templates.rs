//! The workflow templates `cibox init` writes: the CPU layer on every pull request (cibox
//! installed from a release, its checksum verified before it runs, the download
//! cached), the GPU layers on the approved-commit pattern, a nightly warm-up. Every
//! action is pinned by commit (the version in a comment), as zizmor asks.

/// What the rendered workflows need from the repository, said by init's last line.
pub const NEEDS: &str = "repository variables CIBOX_RELEASE_URL (a cibox release's download folder, e.g. https://github.com/OWNER/cibox/releases/download/vX.Y.Z), CIBOX_SHA256 (the sha256 of its cibox-x86_64-unknown-linux-gnu.tar.gz, from its SHA256SUMS), CIBOX_IMAGE_REF (REPOSITORY@sha256:…, from `cibox image push`, pullable without a login: the workflows hold no secrets) and CIBOX_IMAGE_ID (a qualified sha256: image ID); a label run-gpu-ci, which a maintainer puts on a pull request to run its GPU layers (the GPU workflow runs on pull_request_target, so from the default branch: merge it before it can run); self-hosted runners labelled [self-hosted, gpu] with cibox installed";

/// CPU layer on every pull request, on a hosted runner.
pub const CPU_TEMPLATE: &str = r#"<# Written by `cibox init`. The CPU layer on every pull request, on a hosted runner:
   cibox installed from a release in seconds (its download cached, its checksum checked
   before it runs), the image fetched by digest and verified against this checkout's
   lock files. Repository variables: CIBOX_RELEASE_URL (a cibox release's download
   folder), CIBOX_SHA256 (the sha256 of its cibox-x86_64-unknown-linux-gnu.tar.gz, in
   its SHA256SUMS), CIBOX_IMAGE_REF (REPOSITORY@sha256:…, from `cibox image push`). #>
name: << project >> CPU
on:
  pull_request:
  push:
    branches: [main]
permissions:
  contents: read
concurrency:
  group: ${{ github.workflow }}-${{ github.event.pull_request.number || github.ref }}
  cancel-in-progress: true
jobs:
  cpu:
    name: CPU layer
    runs-on: ubuntu-latest
    timeout-minutes: << layers.cpu.max_timeout_minutes + 10 >>
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          persist-credentials: false
      - name: Cache cibox's release
        uses: actions/cache@27d5ce7f107fe9357f9df03efb73ab90386fccae # v5.0.5
        with:
          path: ~/.cache/cibox-release
          key: cibox-release-${{ vars.CIBOX_SHA256 }}
      - name: Install cibox (the checksum is checked before it runs)
        env:
          CIBOX_RELEASE_URL: ${{ vars.CIBOX_RELEASE_URL }}
          CIBOX_SHA256: ${{ vars.CIBOX_SHA256 }}
        run: |
          set -euo pipefail
          dir="$HOME/.cache/cibox-release"
          tarball="$dir/cibox-x86_64-unknown-linux-gnu.tar.gz"
          mkdir -p "$dir" "$HOME/.local/bin"
          # A cached download is checked as a fresh one is: a mismatch is fetched again.
          if ! echo "$CIBOX_SHA256  $tarball" | sha256sum --check --status 2>/dev/null; then
            curl --fail --silent --show-error --location --proto '=https' --retry 3 \
              --output "$tarball" "$CIBOX_RELEASE_URL/cibox-x86_64-unknown-linux-gnu.tar.gz"
            echo "$CIBOX_SHA256  $tarball" | sha256sum --check --strict
          fi
          tar --extract --gzip --file "$tarball" --directory "$HOME/.local/bin" cibox
          echo "$HOME/.local/bin" >> "$GITHUB_PATH"
          "$HOME/.local/bin/cibox" --version
      - name: Fetch the image by digest and verify it against the lock files
        env:
          CIBOX_IMAGE_REF: ${{ vars.CIBOX_IMAGE_REF }}
        run: |
          id=$(cibox image fetch "$CIBOX_IMAGE_REF")
          echo "CIBOX_IMAGE=$id" >> "$GITHUB_ENV"
      - name: Run the CPU layer (<< layers.cpu.batches | join(", ") >>)
        run: cibox layer run cpu
      - name: Keep the reports (result.json is what cibox reproduce replays)
        if: always()
        uses: actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f # v7.0.0
        with:
          name: cibox-reports-${{ github.job }}
          path: cibox-reports/
          if-no-files-found: ignore
"#;

/// GPU layers on the approved-commit pattern, on self-hosted GPU runners.
pub const GPU_TEMPLATE: &str = r#"<# Written by `cibox init`. GPU layers, the approved-commit pattern: a maintainer reads
   the pull request and puts the layer's label on it; the job runs the commit the label
   was put on, never a later push. The workflow is the base branch's, the code the pull
   request's, held in by the host policy and the locked-down container. The image is
   the one the repository variable CIBOX_IMAGE_ID names (a qualified `sha256:` ID). #>
name: << project >> GPU
on:
  # The approved-commit pattern: the pull request's code runs only on the commit a
  # maintainer labelled, in cibox's locked-down container, without secrets.
  pull_request_target: # zizmor: ignore[dangerous-triggers]
    types: [labeled]
permissions:
  contents: read
concurrency:
  group: ${{ github.workflow }}-${{ github.event.pull_request.number }}-${{ github.event.label.name }}
  cancel-in-progress: false
jobs:
<% for name, layer in layers | items %>
<% if layer.meta.label is defined %>
  << name >>:
    name: layer << name >>, ${{ matrix.batch }}
    if: github.event.label.name == << layer.meta.label | ghstr >>
    runs-on: [self-hosted, gpu]
    timeout-minutes: << layer.max_timeout_minutes + 60 + 15 >>
    strategy:
      fail-fast: false
      matrix:
        batch: << layer.batches | tojson >>
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          ref: ${{ github.event.pull_request.head.sha }}
          persist-credentials: false
      - name: Run ${{ matrix.batch }} (<< layer.max_gpus >> GPUs at most)
        env:
          CIBOX_IMAGE: ${{ vars.CIBOX_IMAGE_ID }}
          BATCH: ${{ matrix.batch }}
        run: cibox batch run "$BATCH" --layer << name | shell >> --wait 1h --source .
      - name: Keep the reports (result.json is what cibox reproduce replays)
        if: always()
        uses: actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f # v7.0.0
        with:
          name: cibox-reports-${{ github.job }}-${{ strategy.job-index }}
          path: cibox-reports/
          if-no-files-found: ignore
<% endif %>
<% endfor %>
"#;

/// A nightly run of the GPU layers on the base branch: the runs whose cache writes a
/// trusted host keeps.
pub const WARM_UP_TEMPLATE: &str = r#"<# Written by `cibox init`. Every night, and by hand: the GPU layers on the base branch.
   A scheduled run is one whose cache writes a host with `caches.trusted: true` keeps
   (README: caches a pull request cannot poison), so pull requests start warm. #>
name: << project >> warm-up
on:
  schedule:
    - cron: "17 3 * * *"
  workflow_dispatch:
permissions:
  contents: read
concurrency:
  group: ${{ github.workflow }}
  cancel-in-progress: false
jobs:
<% for name, layer in layers | items %>
<% if layer.meta.label is defined %>
  << name >>:
    name: warm-up, layer << name >>
    runs-on: [self-hosted, gpu]
    timeout-minutes: << layer.batch_list | sum(attribute="timeout_minutes") + 120 + 15 >>
    steps:
      - uses: actions/checkout@3d3c42e5aac5ba805825da76410c181273ba90b1 # v7.0.1
        with:
          persist-credentials: false
      - name: Run layer << name >>
        env:
          CIBOX_IMAGE: ${{ vars.CIBOX_IMAGE_ID }}
        run: cibox layer run << name | shell >> --wait 2h --source .
      - name: Keep the reports
        if: always()
        uses: actions/upload-artifact@bbbca2ddaa5d8feaa63e36b76fdaad77386f024f # v7.0.0
        with:
          name: cibox-reports-${{ github.job }}
          path: cibox-reports/
          if-no-files-found: ignore
<% endif %>
<% endfor %>
"#;
