"""requirements.py: the `requirements=` setting, the modules a pickle names, the pinned closure."""

from __future__ import annotations

import collections
import decimal
import json
import pickle

import cloudpickle
import pytest

from batchfutures import requirements
from batchfutures.errors import ConfigurationError
from batchfutures.settings import JobSettings


def _by_value_user():  # cloudpickle pickles it by value: its globals travel by module name
    return json.dumps(list(collections.OrderedDict(a=1)))


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("auto", "auto"),
    (["tinypkg==1.0", " numpy>=1 "], ("tinypkg==1.0", "numpy>=1")),
    (("a[extra]==2; python_version >= '3'",), ("a[extra]==2; python_version >= '3'",)),
    ([], ()),
])
def test_setting_accepted(value, expected):
    assert requirements.check_setting(value) == expected
    assert JobSettings.from_kwargs(requirements=value).requirements == expected


def test_setting_file_is_made_absolute(tmp_path, monkeypatch):
    (tmp_path / "reqs.txt").write_text("tinypkg==1.0\n")
    monkeypatch.chdir(tmp_path)
    assert requirements.check_setting("reqs.txt") == str(tmp_path / "reqs.txt")


@pytest.mark.parametrize("value, words", [
    (5, "not a int"),
    ("no-such-file.txt", "no file there"),
    (["--index-url=https://user:token@example"], "requirements[0]"),
    (["ok==1", "not a requirement ((("], "requirements[1] is not a requirement"),
    ([""], "requirements[0]"),
    ([3], "not a int"),
])
def test_setting_refused(value, words):
    with pytest.raises(ConfigurationError, match=words.replace("[", r"\[").replace("]", r"\]")) as caught:
        requirements.check_setting(value)
    assert "token" not in str(caught.value)  # an entry's value is never echoed


def test_settings_take_requirements_with_keepalive():
    settings = JobSettings.from_kwargs(requirements=["tinypkg==1.0"], keepalive=60)
    assert settings.requirements == ("tinypkg==1.0",) and settings.keepalive == 60


@pytest.mark.parametrize("payload, modules", [
    (pickle.dumps(collections.OrderedDict(), protocol=0), {"collections"}),
    (pickle.dumps(decimal.Decimal("1.5"), protocol=2), {"decimal"}),
    (pickle.dumps([decimal.Decimal(1), decimal.Decimal(2)], protocol=5), {"decimal"}),
    (cloudpickle.dumps(json.dumps), {"json"}),
    (pickle.dumps({"a": [1, 2.0, "x"]}, protocol=5), set()),
    (b"not a pickle", set()),
])
def test_pickled_modules(payload, modules):
    assert requirements.pickled_modules(payload) == modules


def test_pickled_modules_of_a_by_value_function():
    """Its module globals travel as cloudpickle's subimport("json"), a memoized global reused."""
    cloudpickle.register_pickle_by_value(__import__(__name__))
    try:
        data = cloudpickle.dumps(_by_value_user)
    finally:
        cloudpickle.unregister_pickle_by_value(__import__(__name__))
    assert requirements.pickled_modules(data) == {"json", "collections", "cloudpickle"}


def test_modules_of_reads_a_bounded_share_of_arguments():
    functions = [cloudpickle.dumps(json.dumps)]
    arguments = [pickle.dumps(decimal.Decimal(1)), pickle.dumps(collections.Counter())]
    assert requirements.modules_of(functions, arguments) == {"json", "decimal", "collections"}
    first = len(arguments[0])
    assert requirements.modules_of(functions, arguments, scan_bytes=first) == {"json", "decimal"}


@pytest.mark.parametrize("modules, expected", [
    ({"numpy", "json", "os"}, {"numpy"}),
    ({"sklearn"}, {"scikit-learn"}),
    ({"mine_only", "__main__"}, set()),
    ({"google"}, {"protobuf", "google-auth"}),  # a namespace shared by two distributions
])
def test_distributions_for(modules, expected):
    providers = {"numpy": ["numpy"], "sklearn": ["scikit_learn"], "google": ["protobuf",
                                                                            "google-auth"]}
    assert requirements.distributions_for(modules, providers) == expected


INSTALLED = {"pandas": "2.2.3", "numpy": "2.1.3", "python-dateutil": "2.9.0", "six": "1.17.0",
             "tzdata": "2025.1", "pywin32": "306", "fastparquet": "2024.2.0",
             "boto3": "1.43.1", "botocore": "1.43.1", "jmespath": "1.0.1", "cloudpickle": "3.1.0",
             "batchfutures": "0.1.0", "urllib3": "2.3.0"}
REQUIRES = {
    "pandas": ["numpy>=1.26", "python-dateutil>=2.8.2", "tzdata>=2022.7",
               "pywin32; sys_platform == 'win32'", "fastparquet>=2022.12; extra == 'parquet'",
               "not-installed-dep"],
    "python-dateutil": ["six>=1.5"],
    "boto3": ["botocore>=1.43", "jmespath"],
    "botocore": ["jmespath", "python-dateutil", "urllib3"],
    "batchfutures": ["boto3", "cloudpickle"],
}
MARKERS = requirements.target_markers("x86_64", (3, 11))


@pytest.mark.parametrize("roots, expected", [
    (["pandas"], {"pandas", "numpy", "python-dateutil", "six", "tzdata"}),
    (["Pandas"], {"pandas", "numpy", "python-dateutil", "six", "tzdata"}),
    (["numpy"], {"numpy"}),
    (["not-installed"], set()),
])
def test_closure(roots, expected):
    pinned = requirements.closure(roots, REQUIRES.get, INSTALLED.get, MARKERS)
    assert set(pinned) == expected
    assert all(pinned[name] == INSTALLED[name] for name in pinned)


def test_closure_follows_extras_asked_for():
    requires = {**REQUIRES, "app": ["pandas[parquet]"]}
    installed = {**INSTALLED, "app": "1.0"}
    pinned = requirements.closure(["app"], requires.get, installed.get, MARKERS)
    assert "fastparquet" in pinned and "pywin32" not in pinned


def test_auto_pins_leave_out_the_image():
    pins = requirements.auto_pins({"pandas", "json"}, MARKERS,
                                  providers={"pandas": ["pandas"]},
                                  requires_of=REQUIRES.get, version_of=INSTALLED.get)
    # python-dateutil and six come with botocore in the image: not shipped
    assert pins == ["numpy==2.1.3", "pandas==2.2.3", "tzdata==2025.1"]


def test_auto_pins_leave_out_local_installs_but_not_their_dependencies():
    requires = {**REQUIRES, "myproject": ["pandas"]}
    installed = {**INSTALLED, "myproject": "0.1"}
    pins = requirements.auto_pins({"myproject"}, MARKERS, providers={"myproject": ["myproject"]},
                                  requires_of=requires.get, version_of=installed.get,
                                  is_local=lambda name: name == "myproject")
    assert pins == ["numpy==2.1.3", "pandas==2.2.3", "tzdata==2025.1"]


@pytest.mark.parametrize("text, local", [
    ('{"url": "file:///home/me/project", "dir_info": {"editable": true}}', True),
    ('{"url": "file:///home/me/project", "dir_info": {}}', True),
    ('{"url": "https://example/pkg-1.0-py3-none-any.whl", "archive_info": {}}', False),
    ('{"url": "https://github.com/me/pkg", "vcs_info": {"vcs": "git"}}', False),
    (None, False),
    ("not json", False),
])
def test_is_folder_url(text, local):
    assert requirements.is_folder_url(text) == local
    assert not requirements.installed_from_folder("no-such-distribution")


@pytest.mark.parametrize("machine, python, field, value", [
    ("x86_64", (3, 11), "platform_machine", "x86_64"),
    ("aarch64", (3, 12), "python_version", "3.12"),
    ("aarch64", (3, 12), "sys_platform", "linux"),
    ("x86_64", (3, 9), "python_full_version", "3.9.0"),
])
def test_target_markers(machine, python, field, value):
    assert requirements.target_markers(machine, python)[field] == value


def test_pins_from_report():
    report = {"install": [{"metadata": {"name": "TinyPkg", "version": "1.0"}},
                          {"metadata": {"name": "tiny_dep", "version": "0.2"}},
                          {"metadata": {"name": "boto3", "version": "1.43.1"}},
                          {"metadata": {}}]}
    assert requirements.pins_from_report(report, exclude={"boto3"}) == ["tiny-dep==0.2",
                                                                        "tinypkg==1.0"]
