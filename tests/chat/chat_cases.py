"""Tools and schemas the chat tests share."""


WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}


TIME = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}}


PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "score": {"type": "number"}, "member": {"type": "boolean"},
                                           "tier": {"enum": ["gold", "silver"]}}, "required": ["name"]}


PERSON_TOOL = {"type": "function", "function": {"name": "set_person", "parameters": PERSON}}


LIST_SCHEMA = {"type": "object", "properties": {"cities": {"type": "array", "items": {"type": "string"}}},
               "required": ["cities"]}


WEATHER_SCHEMA = {"type": "json_schema", "json_schema": {"name": "report", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "summary": {"type": "string"}}}}}


#: an array of objects: neither a response_format nor tool parameters can be written key by key
STOPS_SCHEMA = {"type": "object", "properties": {"stops": {"type": "array", "items": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}, "required": ["stops"]}
