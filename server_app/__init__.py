"""The server half of Bouquet (the ServerApp, `server_app.app`). Importing the package filters
Flower's and Ray's known warnings (`strategies.shared.known_warnings`)."""

from strategies.shared.known_warnings import quiet_known_warnings

quiet_known_warnings()
