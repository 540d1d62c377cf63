"""Every answer taken from a KFP server is the KFP API's answer, or an error.

``kfp_server_api`` deserializes whatever comes back with status 200: a body that is not
JSON becomes a string, and a JSON object without one field of the expected model becomes
that model with every field ``None``. So a wrong ``--host`` (a web server, a proxy's page,
another API) reads as "no schedules", or as a pipeline without an id that ``kfp.Client``
later refuses with ``ValueError: Either pipeline_id or pipeline_name is required``.

:func:`install` makes the client check each answer against the model it expects before
deserializing it: JSON, an object where the model is an object, at least one of the model's
fields in every non-empty object (KFP leaves out empty fields, so ``{}`` is a valid empty
list), lists where lists belong, and an id in every pipeline, version, run, experiment and
recurring run it returns. A failed check raises :class:`NotKfpAnswer`, which
:func:`draslice.kfp_ops.errors.api_errors` turns into one line naming the action and host
(after it has taken the caller's secrets out of the body: the body is carried whole, and
shortened only for that line).
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the client loads on connecting: `--help` and input checks need none of it
    import kfp_server_api

# The id every object of these kinds carries on a real server.
ID_FIELDS = {
    "V2beta1Pipeline": "pipeline_id",
    "V2beta1PipelineVersion": "pipeline_version_id",
    "V2beta1Run": "run_id",
    "V2beta1Experiment": "experiment_id",
    "V2beta1RecurringRun": "recurring_run_id",
}


class NotKfpAnswer(Exception):
    """A 2xx answer that is not what the KFP API answers.

    ``text`` is its whole body (None when the bytes are not text at all), ``problem`` what is
    wrong with it as JSON of the expected model (None when it is not JSON)."""

    def __init__(self, status: int, content_type: str, size: int, text: str | None,
                 problem: str | None = None) -> None:
        super().__init__(problem or "not JSON")
        self.status, self.content_type, self.size = status, content_type, size
        self.text, self.problem = text, problem


class NoAnswerInTime(Exception):
    """The server took a connection (or did not) and sent nothing back within the deadline
    of one request, retries included."""

    def __init__(self, seconds: float, connected: bool) -> None:
        super().__init__(f"no answer within {seconds:.0f} s")
        self.seconds, self.connected = seconds, connected


def _model(type_name: str):
    import kfp_server_api

    return getattr(kfp_server_api.models, type_name, None)


def _problem(value, type_name: str, where: str = "") -> str | None:
    """What is wrong with ``value`` as an instance of ``type_name`` at ``where`` (a field
    path, empty for the whole answer); None when it fits."""
    name = type_name.removeprefix("V2beta1")
    what = where or "the answer"
    inner = re.fullmatch(r"list\[(.*)\]", type_name)
    if inner:
        if not isinstance(value, list):
            return f"{what} is {type(value).__name__}, not a list"
        for i, item in enumerate(value):
            problem = _problem(item, inner.group(1), f"{where}[{i}]")
            if problem:
                return problem
        return None
    model = _model(type_name)
    if model is None or not getattr(model, "openapi_types", None):
        return None  # a primitive, 'object', or a free-form struct: any JSON will do
    if not isinstance(value, dict):
        return f"{what} is {type(value).__name__}, not a {name} object"
    fields = {**{json_key: attr for attr, json_key in model.attribute_map.items()},
              **{attr: attr for attr in model.attribute_map}}
    known = [key for key in value if key in fields]
    if value and not known:
        keys = ", ".join(sorted(value)[:5])
        return f"{what} has none of the fields of a {name} (it has {keys})"
    id_field = ID_FIELDS.get(type_name)
    if id_field is not None:
        json_key = model.attribute_map[id_field]
        given = value.get(json_key, value.get(id_field))
        if not isinstance(given, str) or not given:
            return f"{what} is a {name} without {json_key}"
    for key in known:
        path = f"{where}.{key}" if where else key
        problem = _problem(value[key], model.openapi_types[fields[key]], path)
        if problem:
            return problem
    return None


def check_answer(response, response_type: str | None) -> None:
    """Raise :class:`NotKfpAnswer` unless ``response`` (a ``kfp_server_api`` REST response,
    its body already text) is a KFP answer of ``response_type``."""
    if response_type in (None, "file", "bytes"):
        return
    text = response.data if isinstance(response.data, str) else response.data.decode(
        "utf-8", "replace")
    ctype = response.getheader("content-type") or "no Content-Type"
    try:
        doc = json.loads(text)
    except ValueError:
        raise NotKfpAnswer(response.status, ctype, len(text), text) from None
    problem = _problem(doc, response_type)
    if problem:
        raise NotKfpAnswer(response.status, ctype, len(text), text, problem)


def install(api_client: kfp_server_api.ApiClient) -> None:
    """Check every answer ``api_client`` deserializes (the client ``kfp.Client`` builds
    inside itself and shares between its service APIs)."""
    deserialize = api_client.deserialize

    def checked(response, response_type):
        check_answer(response, response_type)
        return deserialize(response, response_type)

    api_client.deserialize = checked  # looked up on the instance by ApiClient.__call_api
