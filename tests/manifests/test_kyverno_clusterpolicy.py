"""The Kyverno ClusterPolicy's variables and preconditions, run with a real JMESPath engine.

Kyverno substitutes ``{{ expr }}`` by evaluating JMESPath on the admission request; a value
that is only one ``{{ }}`` keeps its type. The preconditions are then compared with Kyverno's
operators (GreaterThan, AnyNotIn). The patch is a strategic merge keyed by ``name``; merging
it that way must give the native-mode pod.
"""

from __future__ import annotations

import copy
import re

import jmespath
import pytest

from draslice.cluster.manifests import admission
from draslice.cluster.manifests.podclaim import with_claim
from draslice.cluster.names import CLAIM_LABEL
from draslice.tests.manifests.test_admission_cel import TEMPLATE, kfp_pod

_VAR = re.compile(r"\{\{(.*?)\}\}")
(POLICY,) = admission.admission_policy("kyverno-clusterpolicy")
(RULE,) = POLICY["spec"]["rules"]


def substitute(value, context: dict):
    if isinstance(value, dict):
        return {k: substitute(v, context) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, context) for v in value]
    if not isinstance(value, str):
        return value
    whole = _VAR.fullmatch(value.strip())
    if whole:
        return jmespath.search(whole.group(1).strip(), context)
    return _VAR.sub(lambda m: str(jmespath.search(m.group(1).strip(), context)), value)


def preconditions_hold(pod: dict) -> bool:
    context = {"request": {"object": pod, "operation": "CREATE"}}
    for cond in RULE["preconditions"]["all"]:
        key, value = substitute(cond["key"], context), substitute(cond["value"], context)
        if cond["operator"] == "GreaterThan":
            ok = float(key) > float(value)
        elif cond["operator"] == "AnyNotIn":
            keys = key if isinstance(key, list) else [key]
            ok = any(k not in value for k in keys)
        else:
            raise AssertionError(f"operator {cond['operator']} not modelled")
        if not ok:
            return False
    return True


def _merge_by_name(target: list, patch: list, anchor: str = "name") -> None:
    for item in patch:
        name = item.get(anchor, item.get(f"({anchor})"))
        found = next((t for t in target if t.get("name") == name), None)
        body = {k: v for k, v in item.items() if k != f"({anchor})"}
        if found is None:
            target.append(body)
        else:
            for key, val in body.items():
                if key == "resources":
                    res = found.setdefault("resources", {})
                    _merge_by_name(res.setdefault("claims", []), val["claims"])
                else:
                    found[key] = val


def mutate(pod: dict) -> dict:
    patch = substitute(RULE["mutate"]["patchStrategicMerge"], {"request": {"object": pod}})
    out = copy.deepcopy(pod)
    _merge_by_name(out["spec"].setdefault("resourceClaims", []), patch["spec"]["resourceClaims"])
    _merge_by_name(out["spec"]["containers"], patch["spec"]["containers"])
    return out


def test_labelled_pod_gets_the_native_mode_claim():
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE})
    assert preconditions_hold(pod)
    assert mutate(pod)["spec"] == with_claim(pod["spec"], TEMPLATE)


def test_template_is_read_from_the_label():
    pod = kfp_pod({CLAIM_LABEL: "shared-gpu-mps"})
    assert mutate(pod)["spec"]["resourceClaims"] == [
        {"name": "shared-gpu-mps", "resourceClaimTemplateName": "shared-gpu-mps"}]


@pytest.mark.parametrize("case", ["no-main", "already-claimed"])
def test_preconditions_skip(case):
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE})
    if case == "no-main":
        pod["spec"]["containers"] = [{"name": "driver", "image": "d"}]
    else:
        pod["spec"] = with_claim(pod["spec"], TEMPLATE)
    assert not preconditions_hold(pod)


def test_other_claims_do_not_block():
    pod = kfp_pod({CLAIM_LABEL: TEMPLATE})
    pod["spec"]["resourceClaims"] = [{"name": "nic", "resourceClaimTemplateName": "rdma"}]
    assert preconditions_hold(pod)


def test_unlabelled_pods_are_not_matched():
    selector = RULE["match"]["any"][0]["resources"]["selector"]
    assert selector == {"matchExpressions": [{"key": CLAIM_LABEL, "operator": "Exists"}]}
