"""`build:` (infra/image_build.py): the setting checked in the spec, the context read with its
.dockerignore, the tag a hash of what docker would be sent (nothing else), the tarball Cloud
Build gets, and the Build it is asked to run."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from infra.image_build import (
    cloud_build_request,
    context_tarball,
    ignored,
    parse_dockerignore,
    read_context,
    repository_path,
)
from infra.spec import parse_spec
from infra.stackfile import SpecError
from tests.support.pulumi_mocks import deployable_config


def _project(tmp_path: Path) -> Path:
    ctx = tmp_path / "proj" / "docker"
    (ctx / "src").mkdir(parents=True)
    (ctx / "Dockerfile").write_text("FROM base\nCOPY src /src\n")
    (ctx / "src" / "train.py").write_text("print('hi')\n")
    (ctx / "data.bin").write_bytes(b"\0" * 10)
    return ctx


def test_the_spec_reads_build_and_refuses_it_beside_image() -> None:
    assert parse_spec(deployable_config("dev", build="docker/Dockerfile"), "dev").build == (
        "docker/Dockerfile"
    )
    assert parse_spec(deployable_config("dev"), "dev").build == ""
    with pytest.raises(SpecError) as e:
        parse_spec(deployable_config("dev", build="Dockerfile", image="r.io/a/b:1"), "dev")
    assert str(e.value).startswith(
        "gputrain:build = 'Dockerfile' and gputrain:image = 'r.io/a/b:1' are both set"
    )
    with pytest.raises(SpecError, match="allowed: the path of a Dockerfile"):
        parse_spec(deployable_config("dev", build="docker/"), "dev")
    assert (
        repository_path("us-central1", "p-1", "dev")
        == "us-central1-docker.pkg.dev/p-1/gputrain-dev"
    )


def test_the_tag_is_a_hash_of_the_context(tmp_path: Path) -> None:
    ctx = _project(tmp_path)
    first = read_context("docker/Dockerfile", tmp_path / "proj", "gputrain:build")
    assert first.files == ("Dockerfile", "data.bin", "src/train.py")
    assert first.name == "docker" and first.tag.startswith("ctx-") and len(first.tag) == 20
    again = read_context("docker/Dockerfile", tmp_path / "proj", "gputrain:build")
    assert again.tag == first.tag  # nothing changed: the same tag (timestamps do not count)
    (ctx / "src" / "train.py").touch()
    assert read_context("docker/Dockerfile", tmp_path / "proj", "b").tag == first.tag
    (ctx / "src" / "train.py").write_text("print('changed')\n")
    changed = read_context("docker/Dockerfile", tmp_path / "proj", "b")
    assert changed.tag != first.tag
    (ctx / "src" / "train.py").chmod(0o755)  # the executable bit is part of the image
    assert read_context("docker/Dockerfile", tmp_path / "proj", "b").tag != changed.tag


def test_dockerignore_keeps_files_out_of_the_context_and_the_hash(tmp_path: Path) -> None:
    ctx = _project(tmp_path)
    before = read_context("docker/Dockerfile", tmp_path / "proj", "b").tag
    (ctx / ".dockerignore").write_text("# big files\n*.bin\nDockerfile\n")
    read = read_context("docker/Dockerfile", tmp_path / "proj", "b")
    # the Dockerfile is always sent (as docker does); .dockerignore itself is part of the context
    assert read.files == (".dockerignore", "Dockerfile", "src/train.py")
    (ctx / "data.bin").write_bytes(b"other")  # ignored: no rebuild
    assert read_context("docker/Dockerfile", tmp_path / "proj", "b").tag == read.tag != before
    (ctx / ".dockerignore").write_text("[abc\n")  # docker's build would fail on it
    with pytest.raises(SpecError) as e:
        read_context("docker/Dockerfile", tmp_path / "proj", "build")
    assert str(e.value).startswith(
        "build = 'docker/Dockerfile': docker/.dockerignore: '[abc' is not a pattern docker"
    )


def test_dockerignore_rules() -> None:
    rules = parse_dockerignore("/out\n**/*.pyc\n!keep.pyc\ndata/*/raw\n  \n# c\n.git\n")
    assert ignored("out/model.pt", rules) and ignored("out", rules)
    assert ignored("a/b/c.pyc", rules) and ignored("c.pyc", rules)
    assert not ignored("keep.pyc", rules)  # the last matching rule wins
    assert ignored("data/x/raw/1.txt", rules) and not ignored("data/x/y/raw", rules)
    assert ignored(".git/HEAD", rules) and not ignored("src/out.py", rules)


#: moby/patternmatcher's own TestMatches cases (patternmatcher_test.go, Linux), but paths with a
#: trailing `/` (a context's file names have none): docker's reading of a pattern is ours.
DOCKER_MATCHES = [
    ("**", "file", True), ("**/", "file", True), ("**", "dir/file", True),
    ("**/", "dir/file", True), ("**/**", "dir/file", True), ("dir/**", "dir/file", True),
    ("dir/**", "dir/dir2/file", True), ("**/dir", "dir", True), ("**/dir", "dir/file", True),
    ("**/dir2/*", "dir/dir2/file", True), ("**/dir2/**", "dir/dir2/dir3/file", True),
    ("**file", "file", True), ("**file", "dir/file", True), ("**/file", "dir/file", True),
    ("**file", "dir/dir/file", True), ("**/file", "dir/dir/file", True),
    ("**/file*", "dir/dir/file", True), ("**/file*", "dir/dir/file.txt", True),
    ("**/file*txt", "dir/dir/file.txt", True), ("**/file*.txt", "dir/dir/file.txt", True),
    ("**/file*.txt*", "dir/dir/file.txt", True), ("**/**/*.txt", "dir/dir/file.txt", True),
    ("**/**/*.txt2", "dir/dir/file.txt", False), ("**/*.txt", "file.txt", True),
    ("**/**/*.txt", "file.txt", True), ("a**/*.txt", "a/file.txt", True),
    ("a**/*.txt", "a/dir/file.txt", True), ("a**/*.txt", "a/dir/dir/file.txt", True),
    ("a/*.txt", "a/dir/file.txt", False), ("a/*.txt", "a/file.txt", True),
    ("a/*.txt**", "a/file.txt", True), ("a[b-d]e", "ae", False), ("a[b-d]e", "ace", True),
    ("a[b-d]e", "aae", False), ("a[^b-d]e", "aze", True), (".*", ".foo", True),
    (".*", "foo", False), ("abc.def", "abcdef", False), ("abc.def", "abc.def", True),
    ("abc.def", "abcZdef", False), ("abc?def", "abcZdef", True), ("abc?def", "abcdef", False),
    ("a\\\\", "a\\", True), ("**/foo/bar", "foo/bar", True), ("**/foo/bar", "dir/foo/bar", True),
    ("**/foo/bar", "dir/dir2/foo/bar", True), ("abc/**", "abc", False),
    ("abc/**", "abc/def", True), ("abc/**", "abc/def/ghi", True), ("**/.foo", ".foo", True),
    ("**/.foo", "bar.foo", False), ("a(b)c/def", "a(b)c/def", True),
    ("a(b)c/def", "a(b)c/xyz", False), ("a.|)$(}+{bc", "a.|)$(}+{bc", True),
    ("dist/*.whl", "dist/proxy.py-2.4.0rc3.dev36+g08acad9-py3-none-any.whl", True),
    ("a\\*b", "a*b", True), ("a\\*b", "axb", False),
]  # fmt: skip


@pytest.mark.parametrize(("pattern", "path", "match"), DOCKER_MATCHES)
def test_a_pattern_reads_as_docker_reads_it(pattern: str, path: str, match: bool) -> None:
    assert ignored(path, parse_dockerignore(pattern)) is match


def test_later_rules_and_bad_patterns_as_docker() -> None:
    """patternmatcher's multi-pattern cases; an unclosed class is one line, as docker fails."""
    assert not ignored("util/docker/web/foo", parse_dockerignore("**\n!util/docker/web"))
    rules = parse_dockerignore("**\n!util/docker/web\nutil/docker/web/foo")
    assert ignored("util/docker/web/foo", rules)
    assert not ignored("dist/p-1.whl", parse_dockerignore("**\n!dist/*.whl"))
    with pytest.raises(SpecError) as e:
        parse_dockerignore("*.log\ndata[0-9\n", "ctx/.dockerignore")
    assert str(e.value).startswith("ctx/.dockerignore: 'data[0-9' is not a pattern docker can")
    assert "\n" not in str(e.value)


def test_a_missing_dockerfile_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(SpecError) as e:
        read_context("nope/Dockerfile", tmp_path, "--build")
    assert str(e.value).startswith("--build = 'nope/Dockerfile': no such file (")
    assert "\n" not in str(e.value)


def test_the_tarball_and_the_cloud_build_request(tmp_path: Path) -> None:
    _project(tmp_path)
    ctx = read_context("docker/Dockerfile", tmp_path / "proj", "b")
    data = context_tarball(ctx)
    assert data == context_tarball(ctx)  # the same context, the same bytes
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        assert tar.getnames() == list(ctx.files)
        member = tar.extractfile("src/train.py")
        assert member is not None and member.read() == b"print('hi')\n"
    image = "us-central1-docker.pkg.dev/p/gputrain-dev/docker:" + ctx.tag
    body = cloud_build_request(
        image, "bkt", "gputrain-builds/x.tar.gz", stack="dev", project="p",
        account="gputrain-dev@p.iam.gserviceaccount.com",
    )  # fmt: skip
    # the stack's own account, which needs a logging option (user-specified service accounts)
    assert (
        body["serviceAccount"]
        == "projects/p/serviceAccounts/gputrain-dev@p.iam.gserviceaccount.com"
    )
    assert body["options"] == {"logging": "CLOUD_LOGGING_ONLY"}
    assert body["source"] == {
        "storageSource": {"bucket": "bkt", "object": "gputrain-builds/x.tar.gz"}
    }
    assert body["steps"] == [
        {
            "name": "gcr.io/cloud-builders/docker",
            "args": [
                "build",
                "--network=cloudbuild",
                "--platform=linux/amd64",
                "-f",
                "Dockerfile",
                "-t",
                image,
                ".",
            ],
        }
    ]
    assert body["images"] == [image] and body["tags"] == ["gputrain", "gputrain-stack-dev"]


@pytest.mark.parametrize(
    "build", ["../../etc/passwd", "/etc/passwd", "docker/../../x", "~/Dockerfile"]
)
def test_the_spec_keeps_build_inside_the_project(build: str) -> None:
    with pytest.raises(SpecError, match="inside the project") as e:
        parse_spec(deployable_config("dev", build=build), "dev")
    assert str(e.value).startswith(f"gputrain:build = {build!r}: ")


def test_the_cloud_build_tarball_never_follows_a_link(tmp_path: Path) -> None:
    ctx = _project(tmp_path)
    (tmp_path / "secret.txt").write_text("outside\n")
    (ctx / "data.txt").symlink_to(tmp_path / "secret.txt")
    (ctx / "linked").symlink_to(tmp_path)
    read = read_context("docker/Dockerfile", tmp_path / "proj", "b")
    assert read.files == ("Dockerfile", "data.bin", "src/train.py")
    assert dict(read.skipped) == {
        "data.txt": "symbolic link, not followed",
        "linked": "symbolic link, not followed",
    }
    with tarfile.open(fileobj=io.BytesIO(context_tarball(read))) as tar:
        names = tar.getnames()
        assert names == ["Dockerfile", "data.bin", "src/train.py"]
        assert all(b"outside" not in tar.extractfile(n).read() for n in names)  # type: ignore[union-attr]
