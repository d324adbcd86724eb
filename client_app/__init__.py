"""The client half of Bouquet (the ClientApp, `client_app.app`). Importing the package filters
Flower's and Ray's known warnings (`strategies.shared.known_warnings`): in a simulation Flower imports
the ClientApp before it starts Ray, whose start prints one of them."""

from strategies.shared.known_warnings import quiet_known_warnings

quiet_known_warnings()
